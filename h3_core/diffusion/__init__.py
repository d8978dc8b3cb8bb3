"""Denoising: a request's rows and the packing of N requests (layout), sigma schedules and Euler
(sampling), the request and its limits (request), the step contract prepare -> denoise_step ->
update -> decode (engine). Imports model/, never weights/, parallel/ or serving/: the Engine is
handed its DiT forward (h3_core.factory builds it)."""
