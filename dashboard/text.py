"""Showing untrusted text (run names, file names, kernel names, errors).

Streamlit renders the body of ``st.error``, ``st.caption``, ``st.markdown``
and widget labels as Markdown, which can make links, load remote images
(``![x](http://...)``), colour text or typeset LaTeX. Raw HTML is never
enabled in this app (no ``unsafe_allow_html``), but Markdown alone is enough
to turn a crafted kernel or file name into a link. Every string that comes
from a trace or the file system goes through :func:`plain` before a Markdown
element, and through :func:`html_text` before a Plotly label (Plotly's SVG
text understands a small HTML subset, ``<a href>`` included).
"""

from __future__ import annotations

import html
import re

# CommonMark lets a backslash escape any ASCII punctuation; escape all of
# it, so no Markdown, GFM autolink, directive (``:red[...]``) or ``$`` math
# can form.
_MD_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")


def plain(text: str) -> str:
    """`text` escaped so that Markdown shows it literally, on one line."""
    one_line = " ".join(str(text).split())
    return _MD_SPECIAL.sub(r"\\\1", one_line)


def html_text(text: str) -> str:
    """`text` escaped for Plotly labels and hover text (no tags, no entities)."""
    return html.escape(str(text), quote=True)
