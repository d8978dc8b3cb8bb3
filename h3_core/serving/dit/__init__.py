"""h3_dit's room: the step loop (step_loop) with its arrivals (admission), launch and settle of one
packed step (packed_step), plain-data events (events) and metrics; the scheduler and its
policies (scheduler) and the offline scheduling simulator that drives it (simulate)."""
