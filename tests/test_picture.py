"""The report's pictures with pip packages only: SVG and the interactive HTML page (igraph's layout, no
graphviz), checked as XML and in a real browser (headless Chromium; skipped where none is installed)."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from tvm.relax.dpl import is_op, wildcard

import byoc_hetero as bh
from byoc_hetero import picture

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def resnet_report():
    """Convolutions split by ops no rule takes (sin, cos): three regions, llvm ops between them."""
    from conftest import graph
    from tvm.script import relax as R

    def body(e, x, w1, w2, w3):
        a = e(R.nn.relu(e(R.nn.conv2d(x, w1, padding=1))))
        b = e(R.nn.conv2d(e(R.sin(a)), w2, padding=1))
        c = e(R.nn.conv2d(e(R.cos(a)), w3, padding=1))
        return e(R.add(e(R.sin(b)), c))

    shapes = {"x": (1, 4, 8, 8), "w1": (4, 4, 3, 3), "w2": (4, 4, 3, 3), "w3": (4, 4, 3, 3)}
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s).astype("float32") for k, s in shapes.items() if k != "x"}
    return bh.report(bh.partition(graph(shapes, body), params))


def _nodes(svg_text: str):
    root = ET.fromstring(svg_text)
    return root, [g for g in root.iter(f"{SVG}g") if g.get("class") == "node"]


def test_svg_without_graphviz(resnet_report, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no dot anywhere
    path = resnet_report.render(tmp_path / "g.svg")
    root, nodes = _nodes(path.read_text())
    graph = resnet_report.graph
    assert len(nodes) == len(graph.nodes) and len(graph.nodes) > 3
    edges = [p for p in root.iter(f"{SVG}path") if p.get("class") == "edge"]
    assert len(edges) == len(graph.edges)
    # one fill per target, the colours of the DOT text; region nodes carry their ops for search
    fills = {g.get("data-target"): g.find(f"{SVG}rect").get("fill") for g in nodes}
    assert fills == {t: c for t, c in graph.legend.items() if t in fills} and "onednn" in fills
    regions = [g for g in nodes if g.get("data-target") == "onednn"]
    assert len(regions) == len(resnet_report.regions)
    assert "nn.conv2d" in regions[0].get("data-ops").split()
    # every edge goes downwards: from its source's layer to a later one
    centre_y = {int(g.get("data-index")): float(g.find(f"{SVG}rect").get("y")) for g in nodes}
    for edge in edges:
        assert centre_y[int(edge.get("data-from"))] < centre_y[int(edge.get("data-to"))]
    with pytest.raises(bh.ByocError, match="needs graphviz's 'dot'.*svg and .html need nothing more"):
        resnet_report.render(tmp_path / "g.png")


def test_tooltips_give_a_regions_ops_and_an_ops_reason(restore_rules):
    x, w = wildcard(), wildcard()
    bh.register_target("picky", codegen="byoc_hetero")
    bh.register_pattern("picky", "dense", is_op("relax.matmul")(x, w), {"data": x, "weight": w},
                        check=lambda m: m.shape("weight")[-1] <= 8 or "wider than 8 outputs")
    mod, params = bh.models.mlp(batch=1, features=16, hidden=(8,))  # 16 -> 8 (taken) -> 10 (too wide)
    rep = bh.report(bh.partition(mod, params, target="picky"))
    region = next(n for n in rep.graph.nodes if n.target == "picky")
    assert region.details.startswith("picky region") and "ops: " in region.details and "rules: picky.dense" in region.details
    rejected = [n for n in rep.graph.nodes if "wider than 8 outputs" in n.details]
    assert rejected and all(n.target == "llvm" for n in rejected), [n.details for n in rep.graph.nodes]
    page = picture.page(rep.graph)
    assert "wider than 8 outputs" in page and "<svg" in page and "search op" in page


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.skipif(_chromium() is None, reason="no Chromium/Chrome installed for the browser check")
def test_html_page_in_headless_chromium(resnet_report, tmp_path):
    """The page loads in a real browser, the search runs (?q=conv2d highlights the regions), and the
    screenshot shows the drawing: coloured region boxes, not a blank page."""
    page = resnet_report.render(tmp_path / "g.html")
    shot = tmp_path / "g.png"
    dom = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          f"file://{page}?q=conv2d"], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    hits = dom.stdout.count('class="node hit"')
    assert hits == len(resnet_report.regions) and f">{hits} nodes<" in dom.stdout
    # hovering shows a region's ops and rules, and an llvm op's reason (the page's ?hover=N moves the mouse there)
    nodes = resnet_report.graph.nodes
    region = next(i for i, n in enumerate(nodes) if n.target == "onednn")
    sin = next(i for i, n in enumerate(nodes) if n.ops == ["sin"])
    for index, needles in ((region, ("onednn region", "ops: nn.conv2d", "rules: onednn.")),
                           (sin, ("sin on llvm: no offload rule matches it",))):
        shown = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                                f"file://{page}?hover={index}"], capture_output=True, text=True, timeout=120)
        tip = shown.stdout.split('<div id="tip"', 1)[1].split("</div>", 1)[0]
        assert "display: block" in tip and all(n in tip for n in needles), tip
    run = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                          "--window-size=800,600", f"file://{page}?q=conv2d"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    png = _read_png(shot)
    region_colour = np.array([0x9E, 0xCA, 0xE1])  # the first target's fill (report.PALETTE[0])
    assert (np.abs(png[..., :3].astype(int) - region_colour).sum(axis=-1) < 12).sum() > 500


def _read_png(path):
    """Pixels of an 8-bit RGB(A) PNG without an imaging library (zlib + the PNG filters)."""
    import struct
    import zlib

    data = path.read_bytes()
    pos, chunks, width = 8, [], 0
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + size
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.int32)
    for y in range(height):
        ftype, line = raw[y * (stride + 1)], np.frombuffer(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)], np.uint8)
        cur = line.astype(np.int32)
        if ftype == 1:
            for x in range(channels, stride):
                cur[x] = (cur[x] + cur[x - channels]) & 255
        elif ftype == 2:
            cur = (cur + prev) & 255
        elif ftype == 3:
            for x in range(stride):
                left = cur[x - channels] if x >= channels else 0
                cur[x] = (cur[x] + (left + prev[x]) // 2) & 255
        elif ftype == 4:
            for x in range(stride):
                a = cur[x - channels] if x >= channels else 0
                b, c = prev[x], prev[x - channels] if x >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y], prev = cur, cur
    return out.reshape(height, width, channels)
