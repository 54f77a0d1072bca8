"""A stand-in for the Hugging Face Hub on 127.0.0.1, for testing downloads without a network.

It answers what huggingface_hub asks the Hub when timm or transformers load a model: HEAD / GET of
``/<repo>/resolve/<revision>/<file>`` with the headers the client reads (``X-Repo-Commit``, ``ETag``,
``Content-Length``; ``X-Error-Code`` ``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound`` on a
404), and the few API routes (``/api/models/<repo>[/revision/<rev>]``, ``/api/models/<repo>/tree/<rev>[/<path>]``)
with JSON. Repositories are folders, served as they are; every request is recorded.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Repo:
    def __init__(self, folder: Path, commit: str):
        self.folder, self.commit = Path(folder), commit

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.folder)).replace(os.sep, "/")
                      for p in self.folder.rglob("*") if p.is_file())


class HubServer:
    """``with HubServer() as hub: hub.add("org/name", folder)``; ``hub.url`` is the endpoint to set as HF_ENDPOINT."""

    def __init__(self):
        self.repos: dict[str, _Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def add(self, repo_id: str, folder: str | Path) -> str:
        """Serve ``folder`` as repository ``repo_id`` (its branch ``main``); returns its commit hash."""
        commit = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = _Repo(Path(folder), commit)
        return commit

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def paths(self, method: str | None = None) -> list[str]:
        """The paths requested (of one method)."""
        return [path for verb, path in self.requests if method is None or verb == method]

    def start(self) -> HubServer:
        hub = self

        class Handler(_Handler):
            server_state = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            if self._thread.is_alive():  # shutdown() waits for the serving loop, which must still run
                self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    server_state: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(data)), **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _json(self, status: int, value, body: bool, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})}, body)

    def _error(self, status: int, code: str, message: str, body: bool, commit: str | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._json(status, {"error": message}, body, headers)

    def _answer(self, body: bool) -> None:
        hub = self.server_state
        path = unquote(urlsplit(self.path).path)
        hub.requests.append((self.command, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:
            return self._api(parts[2:], body)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
        self._error(404, "NotFound", f"no route {path}", body)

    def _repo(self, repo_id: str, revision: str, body: bool) -> _Repo | None:
        repo = self.server_state.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", body)
            return None
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision, body)
            return None
        return repo

    def _resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
        repo = self._repo(repo_id, revision, body)
        if repo is None:
            return
        file = repo.folder / filename
        if not file.is_file():
            return self._error(404, "EntryNotFound", f"{filename} does not exist", body, repo.commit)
        data = file.read_bytes()
        self._send(200, data, {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": repo.commit,
                               "Content-Type": "application/octet-stream"}, body)

    def _api(self, parts: list[str], body: bool) -> None:
        repo_id, rest = "/".join(parts[:2]), parts[2:]
        revision = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
        repo = self._repo(repo_id, revision, body)
        if repo is None:
            return
        if rest[:1] == ["tree"]:
            prefix = "/".join(rest[2:])
            entries = [{"type": "file", "path": name, "oid": hashlib.sha1(name.encode()).hexdigest(),
                        "size": (repo.folder / name).stat().st_size}
                       for name in repo.files() if not prefix or name.startswith(prefix + "/")]
            if prefix and not entries:
                return self._error(404, "EntryNotFound", f"{prefix} does not exist", body, repo.commit)
            return self._json(200, entries, body)
        self._json(200, {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False, "gated": False,
                         "siblings": [{"rfilename": name} for name in repo.files()]}, body)


@contextmanager
def silent_endpoint():
    """An endpoint that accepts connections and never answers (a stalled network); yields its URL."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def closed_endpoint() -> str:
    """The URL of a port on 127.0.0.1 that nothing listens on (connections are refused at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"
