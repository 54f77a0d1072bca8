"""An interactive explorer: one self-contained HTML page to browse images, methods and their maps.

``write_explorer(path, items)`` writes a page that works from a file, with no server and no network
(its Content-Security-Policy forbids every fetch): pick an image and a method, or compare methods
side by side; opacity slider; colour scale and colour bar; hover (or arrow keys on a focused map) to
read the token or pixel under the cursor and its raw value; the predicted top-5 classes and the
explained target; the options each map was made with. The page's script and style are the package
files ``explorer.js`` and ``explorer.css``, inlined into ``template.html``.

The page is built in :mod:`.page`; maps are encoded as :mod:`.encoding` says.
"""
from .page import ExplorerItem, explorer_html, write_explorer

__all__ = ["ExplorerItem", "explorer_html", "write_explorer"]
