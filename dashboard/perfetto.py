""" "Open in Perfetto UI": one button per raw trace, by Perfetto's documented postMessage protocol.

Perfetto opens a trace from another page this way ("Deep linking to the Perfetto UI",
https://perfetto.dev/docs/visualization/deep-linking-to-perfetto-ui): the page opens
https://ui.perfetto.dev with ``window.open`` (in the click, so no pop-up blocker stops it),
posts ``'PING'`` until the UI answers ``'PONG'`` (the channel is not buffered: a message sent
before the UI listens is lost), then posts ``{perfetto: {buffer: ArrayBuffer, title, fileName}}``.

The trace reaches the browser only when its button is pressed: the click opens the window and
fires the component's ``open`` trigger; the rerun that trigger causes mounts the same component
with the file's bytes as its data, and the script posts them once the UI has answered. The bytes
are the file as written (gzip for ``.json.gz``): Perfetto's trace processor reads gzip itself, so
nothing is decoded here. Perfetto parses the trace in the browser tab; nothing is uploaded.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import streamlit as st

PERFETTO_URL = "https://ui.perfetto.dev"
# How long a click waits for the Perfetto window to answer and the file to arrive (the UI's first
# visit downloads it, about 10 MB, before it listens).
TIMEOUT_S = 60
# Room left in the server's largest message for what travels with the file (the rest of the
# rerun's page is sent in other messages; this is the component's own envelope, with margin).
ENVELOPE_BYTES = 2**20
REQUEST_BYTES = 4  # the request number that precedes the file's bytes in the data sent

_JS = """
const PERFETTO = "%(url)s";
const TIMEOUT_MS = %(timeout_ms)d;
const REQUEST_BYTES = %(request_bytes)d;
// Per mounted button (the frontend's component key): the Perfetto window it opened, waiting for
// the PONG and for the trace's bytes, whichever comes last.
const pending = new Map();

// Every way a request ends: delivered (why ""), window closed, or out of time.
function finish(key, why) {
  const open = pending.get(key);
  if (!open) return;
  pending.delete(key);
  clearInterval(open.timer);
  clearTimeout(open.deadline);
  window.removeEventListener("message", open.onMessage);
  open.status.textContent = why;
}

function deliver(key) {
  const open = pending.get(key);
  if (!open || !open.ready || !open.buffer) return;
  const message = {perfetto: {buffer: open.buffer, title: open.title, fileName: open.fileName}};
  open.win.postMessage(message, PERFETTO, [open.buffer]);
  finish(key, "");
}

export default function ({key, data, parentElement, setTriggerValue}) {
  let button = parentElement.querySelector("button");
  let status = parentElement.querySelector("span");
  if (!button) {
    button = document.createElement("button");
    button.type = "button";
    status = document.createElement("span");
    parentElement.append(button, status);
  }
  if (data instanceof Uint8Array) {
    // The trace, sent by the rerun this button's click asked for, after its request number. The
    // array may be a view into a larger message buffer: copy exactly the file's bytes.
    const open = pending.get(key);
    if (open) {
      open.buffer = data.slice(REQUEST_BYTES).buffer;
      deliver(key);
    }
    return;
  }
  button.textContent = data.label;
  button.onclick = () => {
    finish(key, "");
    const win = window.open(PERFETTO);
    if (!win) {
      status.textContent = "The browser blocked the Perfetto window: allow pop-ups for this page.";
      return;
    }
    const open = {win, title: data.title, fileName: data.fileName, status, ready: false, buffer: null};
    open.onMessage = (event) => {
      if (event.source !== win || event.data !== "PONG") return;
      clearInterval(open.timer);
      open.ready = true;
      deliver(key);
    };
    // PING carries nothing, so it goes to any origin: until the new window has loaded Perfetto it
    // is about:blank, and a message addressed to Perfetto's origin would only log an error.
    open.timer = setInterval(() => (win.closed ? finish(key, "") : win.postMessage("PING", "*")), 50);
    open.deadline = setTimeout(() => finish(key, data.timeoutText), TIMEOUT_MS);
    window.addEventListener("message", open.onMessage);
    pending.set(key, open);
    status.textContent = "Opening in the Perfetto UI...";
    setTriggerValue("open", true);
  };
}
""" % {"url": PERFETTO_URL, "timeout_ms": TIMEOUT_S * 1000, "request_bytes": REQUEST_BYTES}

# Styled like Streamlit's secondary buttons, from the theme's variables.
_CSS = """
button {
  font-family: var(--st-font);
  font-size: var(--st-base-font-size, 1rem);
  color: var(--st-text-color);
  background: var(--st-secondary-background-color);
  border: 1px solid var(--st-border-color, rgba(49, 51, 63, 0.2));
  border-radius: var(--st-button-radius, 0.5rem);
  padding: 0.25rem 0.75rem;
  min-height: 2.5rem;
  cursor: pointer;
}
button:hover { border-color: var(--st-primary-color); color: var(--st-primary-color); }
span { margin-left: 0.75rem; font-family: var(--st-font); font-size: 0.875rem; color: var(--st-text-color); }
"""

_open_in_perfetto = st.components.v2.component("trainperf.open_in_perfetto", js=_JS, css=_CSS)


def _request(flag: str) -> None:
    """The button's ``open`` trigger fired: the next mount sends the file."""
    st.session_state[flag] = True


def max_message_bytes() -> int:
    """The largest message the Streamlit server sends the browser (``server.maxMessageSize``, MB)."""
    return int(st.get_option("server.maxMessageSize")) * 10**6


def open_in_perfetto(path: Path, *, title: str, file_name: str, key: str) -> None:
    """A button that opens the trace file ``path`` in the Perfetto UI (module doc).

    ``path`` must already be checked to lie below the runs directory. A file larger than the
    server's largest message cannot reach the browser this way: the button is replaced by a
    line saying so (the download beside it still works).
    """
    size = path.stat().st_size
    limit = max_message_bytes()
    if size + ENVELOPE_BYTES > limit:
        st.caption(
            f"{file_name} is {size / 2**20:,.1f} MiB, more than the server sends the browser in one message "
            f"(server.maxMessageSize {limit / 10**6:,.0f} MB): download it and open it in the Perfetto UI."
        )
        return
    flag, sent = f"{key}__send", f"{key}__sent"
    if st.session_state.pop(flag, False):
        # A request number before the bytes: the same file sent twice in a row is then a new message,
        # which the frontend hands to the script again (an identical one it may not).
        st.session_state[sent] = (st.session_state.get(sent, 0) + 1) % 2 ** (8 * REQUEST_BYTES)
        data: object = st.session_state[sent].to_bytes(REQUEST_BYTES, "big") + path.read_bytes()
    else:
        data = {
            "label": "Open in Perfetto UI",
            "title": title,
            "fileName": file_name,
            "timeoutText": f"The trace did not reach the Perfetto UI in {TIMEOUT_S} s: download it and open it there.",
        }
    _open_in_perfetto(key=key, data=data, width="content", height="content", on_open_change=partial(_request, flag))
