"""The few hub API calls a download needs, on an async httpx client (Trio via anyio).

The same calls as llama.cpp's ``hf_cache::get_repo_files``: ``GET {endpoint}api/models/
{repo}/refs`` (branch ``main`` preferred, else the first), then ``GET {endpoint}api/
models/{repo}/tree/{commit}?recursive=true`` (following ``Link: rel="next"`` pages, as
``huggingface_hub`` does). Files come from ``{endpoint}{repo}/resolve/{commit}/{path}``.
Unlike llama.cpp, which swallows every error here and reports success, a failure keeps
the hub's status and reason (`HubError`), so a 404 or 401 reaches the user.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from troupe import __version__
from troupe.catalog.hfcache import is_valid_repo_id, split_repo_tag
from troupe.download.plan import DownloadPlan, PlanError, RemoteFile, make_plan, parse_listing

if TYPE_CHECKING:
    import httpx  # imported when a client is opened: a router that never downloads never does

__all__ = ["HubClient", "HubError", "hf_endpoint", "hf_token", "open_client", "reason"]

DEFAULT_ENDPOINT = "https://huggingface.co/"
_COMMIT = re.compile(r"[0-9a-fA-F]{40}\Z")
_MAX_PAGES = 1000


class HubError(Exception):
    """The hub refused (``status`` is its HTTP status, 0 for a network failure)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.status == 0 or self.status in (408, 429) or self.status >= 500


def hf_endpoint(environ: Mapping[str, str]) -> str:
    """``MODEL_ENDPOINT``, then ``HF_ENDPOINT``, default huggingface.co; ends with ``/``."""
    endpoint = environ.get("MODEL_ENDPOINT") or environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    return endpoint if endpoint.endswith("/") else endpoint + "/"


def hf_token(environ: Mapping[str, str], flag: str | None = None) -> str:
    """``--hf-token`` wins over ``HF_TOKEN`` (llama-server's rule for its flags)."""
    return flag or environ.get("HF_TOKEN", "")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def open_client(
    token: str = "",
    *,
    endpoint: str | None = None,
    connect_timeout: float = 10,
    read_timeout: float = 30,
) -> httpx.AsyncClient:
    """One client per job: redirects followed; a read that stalls for ``read_timeout``
    seconds is a transient error. The token goes only to the hub (``endpoint``'s scheme,
    host and port; default `hf_endpoint` of the environment), as ``huggingface_hub``
    does: a ``Link: rel="next"`` page or a file URL elsewhere is asked for without it,
    and httpx drops it from a redirect that leaves the hub (a CDN)."""
    import httpx  # noqa: PLC0415  (~8 MiB: only once a download starts)

    hub = _origin(endpoint if endpoint is not None else hf_endpoint(os.environ))

    class HubOnly(httpx.Auth):
        def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response]:
            if _origin(str(request.url)) == hub:
                request.headers["Authorization"] = f"Bearer {token}"
            yield request

    headers = {"User-Agent": f"troupe/{__version__}"}
    timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
    return httpx.AsyncClient(
        headers=headers,
        timeout=timeout,
        follow_redirects=True,
        auth=HubOnly() if token else None,
    )


def reason(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        msg = body.get("error") if isinstance(body, dict) else None
    except ValueError:
        msg = None
    if not isinstance(msg, str) or not msg:
        msg = resp.reason_phrase or "error"
    return f"{resp.status_code} {msg}"


class HubClient:
    def __init__(self, client: httpx.AsyncClient, endpoint: str) -> None:
        self.client = client
        self.endpoint = endpoint

    def file_url(self, repo: str, commit: str, path: str) -> str:
        return f"{self.endpoint}{repo}/resolve/{commit}/{quote(path)}"

    async def _get_json(self, url: str, what: str) -> tuple[object, httpx.Response]:
        import httpx  # noqa: PLC0415  (loaded already: the client is httpx's)

        try:
            resp = await self.client.get(url, headers={"Accept": "application/json"})
        except httpx.HTTPError as exc:
            raise HubError(f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        if resp.status_code != 200:
            raise HubError(f"{what}: {reason(resp)}", resp.status_code)
        try:
            return resp.json(), resp
        except ValueError:
            raise HubError(f"{what}: the hub answered something that is not JSON", 502) from None

    async def commit(self, repo: str) -> tuple[str, str]:
        """``(branch, commit)`` of the repository's ``main`` branch, else its first."""
        data, _ = await self._get_json(f"{self.endpoint}api/models/{repo}/refs", repo)
        branches = data.get("branches") if isinstance(data, dict) else None
        found: tuple[str, str] | None = None
        for b in branches if isinstance(branches, list) else []:
            if not isinstance(b, dict):
                continue
            name, commit = b.get("name"), b.get("targetCommit")
            if not isinstance(name, str) or not isinstance(commit, str):
                continue
            if not _COMMIT.match(commit) or not _safe_ref(name):
                continue
            if name == "main":
                return name, commit.lower()
            found = found or (name, commit.lower())
        if found is None:
            raise HubError(f"{repo}: the hub lists no valid branch", 404)
        return found

    async def tree(self, repo: str, commit: str) -> list[RemoteFile]:
        url: str | None = f"{self.endpoint}api/models/{repo}/tree/{commit}?recursive=true"
        items: list[object] = []
        for _ in range(_MAX_PAGES):
            if url is None:
                break
            data, resp = await self._get_json(url, repo)
            if not isinstance(data, list):
                raise HubError(f"{repo}: the hub's file list is not a list", 502)
            items += data
            url = resp.links.get("next", {}).get("url")
        return parse_listing(items)

    async def plan(self, name: str, *, mmproj: bool = True) -> DownloadPlan:
        """What ``name`` (``org/repo[:TAG]``) means on the hub today.

        Raises `HubError` (the hub refused or could not be reached) or `PlanError`."""
        try:
            repo, tag = split_repo_tag(name)
        except Exception as exc:  # ConfigError: the format message, as upstream
            raise PlanError(str(exc)) from None
        if not is_valid_repo_id(repo):
            raise PlanError(f"invalid repository id: '{repo}'")
        branch, commit = await self.commit(repo)
        files = await self.tree(repo, commit)
        return make_plan(name, repo, tag, branch, commit, files, mmproj=mmproj)


def _safe_ref(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)
