"""A page's layout as headless Chromium lays it out: its height, where a heading starts and
which tables are wider than the element that holds them. The measuring script is added to a
copy of the page, runs after load and writes its answer into the DOM Chromium dumps."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

WIDTH = 1400  # the report width the layout is held to, in CSS px
SETTLE_MS = 1500  # after load: a page its own script renders (Snakemake's report) has drawn

# Measured in the page: the document's height and width, the top of the first heading whose
# text starts with each wanted prefix, and each table whose box or content is wider than its
# container (the caption or heading before it names it).
_MEASURE = """<script>window.addEventListener('load',()=>setTimeout(()=>{
const top=e=>e.getBoundingClientRect().top+window.scrollY;
const heads=[...document.querySelectorAll('h1,h2,h3,p.rubric')];
const starts={};for(const p of WANTED){const h=heads.find(x=>x.textContent.trim().startsWith(p));
starts[p]=h?top(h):null;}
const wide=[...document.querySelectorAll('table')].filter(t=>{const box=t.parentElement
.getBoundingClientRect();const r=t.getBoundingClientRect();
return r.right>box.right+0.5||r.left<box.left-0.5||t.scrollWidth>t.clientWidth+1;})
.map(t=>(t.caption||t.previousElementSibling||t).textContent.slice(0,80));
const cut=[...document.querySelectorAll('td,th')].filter(c=>c.scrollWidth>c.clientWidth+1)
.map(c=>c.textContent.slice(0,60));
const out=document.createElement('pre');out.id='layout';out.textContent=JSON.stringify({
height:document.documentElement.scrollHeight,width:document.documentElement.scrollWidth,
starts:starts,wide:wide,cut:cut});document.body.appendChild(out);},SETTLE_MS));</script>"""


def measure(page: Path, chromium: str, flags: list[str], wanted: list[str], scratch: Path,
            width: int = WIDTH) -> dict:
    """Lay ``page`` out at ``width`` px and return {height, width, starts: {prefix: top px},
    wide: [tables wider than their container], cut: [cells whose text is clipped]}. The
    measured copy of the page is written into ``scratch``."""
    copy = scratch / (page.stem + ".measured.html")
    script = _MEASURE.replace("WANTED", json.dumps(wanted)).replace("SETTLE_MS", str(SETTLE_MS))
    text = page.read_text()
    end = text.rfind("</body>")  # the page's own: a script earlier may spell the tag too
    copy.write_text(text[:end] + script + text[end:] if end >= 0 else text + script)
    dom = subprocess.run([chromium, *flags, f"--window-size={width},1000", "--dump-dom",
                          copy.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom, flags=re.S)
    assert found, dom[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&")
                      .replace("&lt;", "<").replace("&gt;", ">"))

