"""An OpenAI-compatible Videos API and a browser page in front of Triton (`python -m videos_api`;
docs/videos_api.md), an HTTP service of its own beside the launcher (server/). fields: OpenAI's
request fields -> h3_pipeline's and errors -> HTTP codes; store: jobs in SQLite; jobs: generation
through client.api.H3Client, files, the restart rule, retention; app: the FastAPI routes and the
page (static/).
"""
