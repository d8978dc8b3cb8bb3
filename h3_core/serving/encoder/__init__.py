"""h3_encoder's room: a request's prompt and media -> text states and condition latents
(conditioning)."""
