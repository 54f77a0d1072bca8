"""An interactive explorer: one self-contained HTML page to browse images, methods and their maps.

``write_explorer(path, items)`` writes a page that works from a file, with no server and no network
(its Content-Security-Policy forbids every fetch): pick an image and a method, or compare methods
side by side; opacity slider; colour scale and colour bar; hover (or arrow keys on a focused map) to
read the token or pixel under the cursor and its raw value; the predicted top-5 classes and the
explained target; the options each map was made with. The page's script and style are the package
files ``explorer.js`` and ``explorer.css``, inlined with ``template.html`` (its body) into the page every HTML
output of vitexplain shares (:mod:`vitexplain.html_page`).

In a notebook, ``ExplorerPage(items)`` shows the page inline (and ``.save(path)`` writes it), and
``explorer_items(images, maps, ...)`` makes the items of a batch. The page is built in :mod:`.page`;
maps are encoded as :mod:`.encoding` says.
"""
from .page import ExplorerItem, ExplorerPage, explorer_html, explorer_items, write_explorer

__all__ = ["ExplorerItem", "ExplorerPage", "explorer_html", "explorer_items", "write_explorer"]
