"""Container health check: exit 0 when the local server answers GET /v2/health/ready with 2xx."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

READY_PATH = "/v2/health/ready"


def ready_url(environ: dict[str, str]) -> str:
    """Return the readiness URL of the server in this container, from HYBRIDSERVE_PORT."""
    port = environ.get("HYBRIDSERVE_PORT", "8000")
    return f"http://127.0.0.1:{port}{READY_PATH}"


def check(url: str, timeout: float) -> str | None:
    """Return None when `url` answers 2xx within `timeout` seconds, else why it did not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        return f"{url} answered HTTP {error.code}; expected 2xx"
    except (urllib.error.URLError, OSError) as error:
        return f"{url} unreachable: {error}"
    if not 200 <= status < 300:
        return f"{url} answered HTTP {status}; expected 2xx"
    return None


def main(argv: list[str] | None = None) -> int:
    """Probe the server once; the optional argument overrides the URL."""
    args = sys.argv[1:] if argv is None else argv
    url = args[0] if args else ready_url(dict(os.environ))
    problem = check(url, timeout=float(os.environ.get("HYBRIDSERVE_HEALTHCHECK_TIMEOUT", "3")))
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
