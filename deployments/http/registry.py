"""`DIALECTS`: every client API the HTTP face speaks, the one place the application looks them up. Adding one is a
module defining a `Dialect` and one entry here."""

from __future__ import annotations

from deployments.http.cohere import CohereDialect
from deployments.http.dialect import Dialect
from deployments.http.openai import OpenAIDialect
from deployments.http.tei import TeiDialect

DIALECTS: tuple[Dialect, ...] = (CohereDialect(), OpenAIDialect(), TeiDialect())
DEFAULT_DIALECT = DIALECTS[-1]  # answers errors on paths no dialect owns (an unknown path: 404), in TEI's body
