"""The partitioned graph as a picture, with pip packages only: an SVG file and an interactive HTML page.

The report (:mod:`byoc_hetero.report`) collects a :class:`Graph` of ``main``: one node per binding,
coloured by the target that runs it, with a tooltip (a region's ops, rules, inputs and outputs; an
op left on llvm with the reason). This module lays it out and draws it.

Layout: ``igraph``'s Sugiyama layered layout (``Graph.layout_sugiyama``: layers by longest path,
crossing reduction by barycenters, long edges routed through dummy vertices, whose positions come
back as the layout's ``edge_routing``). igraph is maintained,
ships binary wheels on PyPI for Linux, macOS and Windows, and lays out thousands of nodes in well
under a second; the pure-Python alternative (grandalf) last released in 2023. Graphviz's ``dot``
is still used where it is asked for (``engine="dot"``, and ``.png``/``.pdf``), never needed for
``.svg`` or ``.html``.

The HTML page is one self-contained file (no network): the SVG plus a small script for zoom (wheel),
pan (drag), search by op name (matching nodes highlighted, the rest dimmed) and a details box on
hover.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field

FONT_SIZE = 11
CHAR_W = 6.6  # average advance of an 11 px sans-serif character, for sizing boxes
LINE_H = 14
PAD_X, PAD_Y = 10, 6
GAP_X, GAP_Y = 24, 36


@dataclass
class Node:
    """One node of the picture: a label (lines), the target that runs it, details for the tooltip."""

    id: str
    lines: list[str]
    target: str
    colour: str
    shape: str = "box"
    details: str = ""
    #: op names inside the node (a region's ops, or the op itself): what search matches
    ops: list[str] = field(default_factory=list)

    @property
    def width(self) -> float:
        return max(len(line) for line in self.lines) * CHAR_W + 2 * PAD_X

    @property
    def height(self) -> float:
        return len(self.lines) * LINE_H + 2 * PAD_Y


@dataclass
class Graph:
    """Nodes and edges (pairs of node indices) of the partitioned ``main``, plus the legend."""

    nodes: list[Node] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    legend: dict[str, str] = field(default_factory=dict)  # target -> colour


def _igraph():
    try:
        import igraph
    except ImportError as err:  # pragma: no cover - igraph is a dependency of the package
        from .errors import ByocError

        raise ByocError("drawing .svg/.html needs the 'igraph' package (pip install igraph)") from err
    return igraph


def layout(graph: Graph) -> tuple[list[tuple[float, float]], list[list[tuple[float, float]]]]:
    """Centre coordinates of each node and, per edge, its polyline (bends where igraph routed a
    long edge through a dummy vertex)."""
    ig = _igraph()
    n = len(graph.nodes)
    lay = ig.Graph(n=n, edges=graph.edges, directed=True).layout_sugiyama(hgap=1, vgap=1, maxiter=100)
    coords = [tuple(c) for c in lay.coords]
    routing = getattr(lay, "edge_routing", None) or [[] for _ in graph.edges]
    col_w = max((node.width for node in graph.nodes), default=40) + GAP_X
    layers = sorted({round(y) for _, y in coords})
    tallest = {y: LINE_H for y in layers}
    for node, (_, y) in zip(graph.nodes, coords):
        tallest[round(y)] = max(tallest[round(y)], node.height)
    top, y_of = 30 + GAP_Y / 2, {}  # below the legend
    for y in layers:
        y_of[y] = top + tallest[y] / 2
        top += tallest[y] + GAP_Y
    x0 = min((x for x, _ in coords), default=0.0)

    def point(x: float, y: float) -> tuple[float, float]:
        return ((x - x0) * col_w + col_w / 2, y_of.get(round(y), top))

    centres = [point(x, y) for x, y in coords]
    routes = [[centres[a], *(point(*p) for p in bends), centres[b]]
              for (a, b), bends in zip(graph.edges, routing)]
    return centres, routes


def _node_svg(i: int, node: Node, cx: float, cy: float) -> str:
    w, h = node.width, node.height
    x, y = cx - w / 2, cy - h / 2
    rx = h / 2 if node.shape == "ellipse" else 6
    text = "".join(
        f'<text x="{cx:.1f}" y="{y + PAD_Y + LINE_H * (k + 0.8):.1f}" text-anchor="middle">{html.escape(line)}</text>'
        for k, line in enumerate(node.lines))
    ops = html.escape(" ".join(node.ops))
    return (f'<g class="node" id="{node.id}" data-index="{i}" data-ops="{ops}" data-target="{html.escape(node.target)}">'
            f'<title>{html.escape(node.details or " / ".join(node.lines))}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx:.1f}" '
            f'fill="{node.colour}" stroke="#555"/>{text}</g>')


def svg(graph: Graph) -> str:
    """The graph as an SVG document (a legend of target colours at the top)."""
    centres, routes = layout(graph)
    parts = []
    for (a, b), route in zip(graph.edges, routes):
        src, dst = graph.nodes[a], graph.nodes[b]
        pts = [(route[0][0], route[0][1] + src.height / 2), *route[1:-1], (route[-1][0], route[-1][1] - dst.height / 2)]
        d = " ".join(f"{'M' if k == 0 else 'L'}{x:.1f},{y:.1f}" for k, (x, y) in enumerate(pts))
        parts.append(f'<path class="edge" data-from="{a}" data-to="{b}" d="{d}"/>')
    for i, (node, (cx, cy)) in enumerate(zip(graph.nodes, centres)):
        parts.append(_node_svg(i, node, cx, cy))
    right = max((cx + node.width / 2 for node, (cx, _) in zip(graph.nodes, centres)), default=100) + GAP_X
    bottom = max((cy + node.height / 2 for node, (_, cy) in zip(graph.nodes, centres)), default=100) + GAP_Y
    legend, lx = [], 8.0
    for target, colour in graph.legend.items():
        legend.append(f'<rect x="{lx:.1f}" y="6" width="12" height="12" fill="{colour}" stroke="#555"/>'
                      f'<text x="{lx + 16:.1f}" y="16">{html.escape(target)}</text>')
        lx += 30 + len(target) * CHAR_W
    width, height = max(right, lx), bottom
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" '
            f'font-size="{FONT_SIZE}">'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#666"/></marker></defs>'
            '<style>.edge{fill:none;stroke:#888;stroke-width:1.2;marker-end:url(#arrow)}'
            '.node text{pointer-events:none}</style>'
            f'<g class="legend">{"".join(legend)}</g>'
            f'<g class="graph">{"".join(parts)}</g></svg>')


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{margin:0;font-family:Helvetica,Arial,sans-serif;font-size:13px}
#bar{position:fixed;top:0;left:0;right:0;height:36px;background:#f4f4f4;border-bottom:1px solid #ccc;
 display:flex;align-items:center;gap:10px;padding:0 10px;z-index:2}
#view{position:fixed;top:37px;left:0;right:0;bottom:0;overflow:hidden;cursor:grab}
#view svg{width:100%;height:100%}
#tip{position:fixed;display:none;max-width:520px;white-space:pre-wrap;background:#fffde8;border:1px solid #999;
 padding:6px 8px;font-family:monospace;font-size:12px;z-index:3;pointer-events:none}
.node.dim{opacity:.18}.node.hit rect{stroke:#d00;stroke-width:3}
</style></head><body>
<div id="bar"><b>__TITLE__</b><input id="q" placeholder="search op (e.g. conv2d)" size="28">
<span id="count"></span><button id="fit">fit</button><span style="color:#666">wheel: zoom, drag: pan,
 hover: details</span></div>
<div id="view">__SVG__</div><div id="tip"></div>
<script>
const svg=document.querySelector('#view svg'), tip=document.getElementById('tip');
const details=__DETAILS__;
const full=svg.viewBox.baseVal; let vb={x:full.x,y:full.y,w:full.width,h:full.height};
const home=Object.assign({},vb);
function apply(){svg.setAttribute('viewBox',`${vb.x} ${vb.y} ${vb.w} ${vb.h}`);}
const box=svg.getBoundingClientRect();
if(full.height>2*box.height||full.width>2*box.width){  // a large graph opens at 1:1 on its top, not squeezed
 vb={x:full.x+Math.max(0,full.width/2-box.width/2),y:full.y,w:box.width,h:box.height};apply();}
function centre(n){const b=n.getBBox();vb.x=b.x+b.width/2-vb.w/2;vb.y=b.y+b.height/2-vb.h/2;apply();}
svg.addEventListener('wheel',e=>{e.preventDefault();const r=svg.getBoundingClientRect();
 const s=e.deltaY>0?1.2:1/1.2; const px=vb.x+(e.clientX-r.left)/r.width*vb.w, py=vb.y+(e.clientY-r.top)/r.height*vb.h;
 vb={x:px-(px-vb.x)*s,y:py-(py-vb.y)*s,w:vb.w*s,h:vb.h*s};apply();},{passive:false});
let drag=null;
svg.addEventListener('mousedown',e=>{drag={x:e.clientX,y:e.clientY,vb:Object.assign({},vb)};});
window.addEventListener('mouseup',()=>{drag=null;});
window.addEventListener('mousemove',e=>{if(!drag)return;const r=svg.getBoundingClientRect();
 vb.x=drag.vb.x-(e.clientX-drag.x)/r.width*vb.w; vb.y=drag.vb.y-(e.clientY-drag.y)/r.height*vb.h; apply();});
document.getElementById('fit').onclick=()=>{vb=Object.assign({},home);apply();};
document.querySelectorAll('.node').forEach(n=>{
 n.addEventListener('mousemove',e=>{tip.textContent=details[n.dataset.index];tip.style.display='block';
  tip.style.left=(e.clientX+14)+'px';tip.style.top=(e.clientY+14)+'px';});
 n.addEventListener('mouseleave',()=>{tip.style.display='none';});});
function search(q){q=q.trim().toLowerCase();let hits=0;
 document.querySelectorAll('.node').forEach(n=>{const ops=n.dataset.ops.toLowerCase();
  const hit=q&&ops.split(' ').some(o=>o.includes(q));n.classList.toggle('hit',!!hit);
  n.classList.toggle('dim',!!q&&!hit);if(hit&&!hits++)centre(n);});
 document.getElementById('count').textContent=q?hits+' nodes':'';return hits;}
document.getElementById('q').addEventListener('input',e=>search(e.target.value));
const params=new URLSearchParams(location.search), initial=params.get('q'), hover=params.get('hover');
if(initial){document.getElementById('q').value=initial;search(initial);}
if(hover!==null){const n=document.querySelector(`.node[data-index="${hover}"]`);  // ?hover=N: node N's details
 if(n)n.dispatchEvent(new MouseEvent('mousemove',{clientX:40,clientY:60,bubbles:true}));}
</script></body></html>
"""


def page(graph: Graph, title: str = "byoc-hetero partition") -> str:
    """A self-contained HTML page: the SVG with zoom, pan, search by op and details on hover.

    ``page.html?q=conv2d`` opens with that search applied, ``page.html?hover=3`` with node 3's details
    shown (as when the mouse is on it)."""
    details = [node.details or "\n".join(node.lines) for node in graph.nodes]
    return (_PAGE.replace("__TITLE__", html.escape(title))
            .replace("__DETAILS__", json.dumps(details).replace("</", "<\\/"))
            .replace("__SVG__", svg(graph)))
