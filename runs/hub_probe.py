"""Is the Hugging Face Hub reachable? One short request, decided once per process, in about a second.

huggingface_hub, transformers and datasets spend 20-30 s retrying an unreachable Hub before they fail, and
`snapshot_download` waits forever on a server that accepts a connection and never answers (measured with 2.4.0).
So prime-lab asks first: one `HEAD` of the endpoint (`HF_ENDPOINT`, else https://huggingface.co) with a deadline of
`PROBE_SECONDS` for everything (name lookup, connect, the answer's status line). Any HTTP answer, an error status
included, means online; a refused port, a name that does not resolve, a black-hole socket or a server slower than
the deadline mean offline. `HF_HUB_OFFLINE` set by the user always wins (1/true/yes/on: offline; anything else:
online, unprobed). The answer is kept for the rest of the process, per endpoint.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_SECONDS = 1.0
_TRUE = {"1", "on", "yes", "true"}

_decided: dict[str, str | None] = {}  # endpoint -> why it is out of reach (None: it answered)
_lock = threading.Lock()


def hub_endpoint() -> str:
    """The Hub's base URL as huggingface_hub uses it (`HF_ENDPOINT`), read now."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def user_offline_choice() -> bool | None:
    """True or False when the user set `HF_HUB_OFFLINE` (huggingface_hub's reading of it), None when unset."""
    value = os.environ.get("HF_HUB_OFFLINE")
    if value is None or not value.strip():
        return None
    return value.strip().lower() in _TRUE


def hub_online(endpoint: str | None = None) -> bool:
    """Whether this process uses the Hub: the user's `HF_HUB_OFFLINE` if set, else one probe of `endpoint` (the
    configured one by default), asked once per process and endpoint."""
    return offline_reason(endpoint) is None


def offline_reason(endpoint: str | None = None) -> str | None:
    """Why this process does not use the Hub, in words ("HF_HUB_OFFLINE is set", "... did not answer: ..."), or None
    when it does."""
    chosen = user_offline_choice()
    if chosen is not None:
        return "HF_HUB_OFFLINE is set" if chosen else None
    return probed_reason(endpoint)


def probed_reason(endpoint: str | None = None) -> str | None:
    """The probe's answer for `endpoint` (the configured one by default), whatever the user set: why the Hub
    cannot be reached, or None when it answered. Probed once per process and endpoint."""
    url = (endpoint or hub_endpoint()).rstrip("/")
    with _lock:
        if url not in _decided:
            why = probe(url)
            _decided[url] = None if why is None else f"the Hugging Face Hub at {url} cannot be reached ({why})"
        return _decided[url]


def probe(endpoint: str, seconds: float = PROBE_SECONDS) -> str | None:
    """None when `endpoint` answers HTTP within `seconds`; else why not, in a few words. The request runs in a
    daemon thread so that nothing (a name lookup, a server that trickles its answer) outlasts the deadline."""
    outcome: list[str | None] = []

    def ask() -> None:
        request = urllib.request.Request(endpoint + "/", method="HEAD", headers={"User-Agent": "prime-lab"})
        try:
            with urllib.request.urlopen(request, timeout=seconds):
                outcome.append(None)
        except urllib.error.HTTPError:  # it answered: reachable, whatever it thinks of "/"
            outcome.append(None)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            outcome.append(str(reason) or type(exc).__name__)

    thread = threading.Thread(target=ask, name="hub-probe", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        return f"no answer within {seconds:g} s"
    return outcome[0]
