"""`Dialect`: one client API (Cohere, OpenAI, TEI) spoken over HTTP. A dialect owns its request and response
models, the routes that convert them to and from the tasks' requests and results (`RerankRequest(...)`, then
`service.run(request, NAMES)`), the table naming the library's fields as its clients do (`NAMES`, applied to a
task's structured error), and the error body its clients parse; `deployments.http.app` builds the application
from the registry `DIALECTS` (`deployments.http.registry`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from fastapi import APIRouter

from deployments.http.errors import ErrorKind
from deployments.http.service import Service


class Dialect(ABC):
    name: ClassVar[str]

    @abstractmethod
    def router(self, service: Service) -> APIRouter:
        """The dialect's routes; those that compute depend on `service.authorize`."""

    @abstractmethod
    def error_body(self, kind: ErrorKind, message: str) -> dict[str, Any]:
        """The JSON body of an error, in the shape the dialect's SDK reads its message from."""
