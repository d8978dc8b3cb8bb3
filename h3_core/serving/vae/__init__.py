"""h3_vae's room: the decode threads in request order (ordered_pool), open decodes and
keep-alives (decodes), cancels for clients that went away (gone_clients)."""
