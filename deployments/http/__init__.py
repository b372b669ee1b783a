"""The HTTP face of the application: Cohere's, OpenAI's and TEI's APIs as FastAPI routes on the `Ingress`
(`build_app`), one module per dialect (`cohere`, `openai`, `tei`), registered in `registry.DIALECTS`."""

from deployments.http.app import build_app

__all__ = ["build_app"]
