"""Render a markdown page's Mermaid diagrams to PNG, one file per diagram, to look at them as a reader would.

    python scripts/render_diagrams.py docs/design.md /tmp/diagrams

Each ```mermaid block of the page is drawn by @mermaid-js/mermaid-cli (mmdc) in Debian's chromium, headless
(`apt-get install chromium`): <out>/<page>-<n>.png, n counted from 1 in the page's order. The npm package is
installed, without puppeteer's own browser, into a throwaway folder (.run/mermaid-cli, or MERMAID_CLI_DIR) on first
use. A diagram Mermaid cannot parse stops the script with mmdc's message and the block's line, rather than a PNG of
Mermaid's "Syntax error" box. Not part of `make test`: it needs npm and chromium, which the tests do not.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MERMAID_CLI = "@mermaid-js/mermaid-cli@11"  # mmdc; Mermaid 11, what GitHub renders with
CHROMIUM = "/usr/bin/chromium"  # Debian's; puppeteer's own download is skipped
WIDTH = 1400  # px of the page mmdc draws on: the widest diagram (the money rule's states) fits
SCALE = 2  # device pixels per CSS pixel: text stays legible when the PNG is zoomed
RENDER_SECONDS = 120  # one diagram, chromium's start included, on a busy machine
_BLOCK = re.compile(r"^```mermaid[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def diagrams(page):
    """Each Mermaid block of page: (its line, its text)."""
    text = page.read_text()
    return [(text.count("\n", 0, found.start()) + 1, found.group(1)) for found in _BLOCK.finditer(text)]


def mmdc(folder):
    """The mmdc of folder, installed there first when it is missing."""
    program = folder / "node_modules" / ".bin" / "mmdc"
    if not program.exists():
        if not shutil.which("npm"):
            sys.exit("render_diagrams: npm is missing (Debian: apt-get install npm)")
        folder.mkdir(parents=True, exist_ok=True)
        print(f"installing {MERMAID_CLI} into {folder}", file=sys.stderr)
        subprocess.run(["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel=error",
                        MERMAID_CLI], env={**os.environ, "PUPPETEER_SKIP_DOWNLOAD": "1"}, check=True)
    return program


def render(page, out, folder):
    """Write out/<page>-<n>.png for each diagram of page; return their paths."""
    if not Path(CHROMIUM).exists():
        sys.exit(f"render_diagrams: {CHROMIUM} is missing (Debian: apt-get install chromium)")
    found = diagrams(page)
    if not found:
        sys.exit(f"render_diagrams: {page} has no ```mermaid block")
    program = mmdc(folder)
    # As root (a container, CI) chromium runs only without its sandbox.
    browser = folder / "puppeteer.json"
    browser.write_text(json.dumps({"executablePath": CHROMIUM, "args": ["--no-sandbox", "--disable-gpu"]}))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for number, (line, text) in enumerate(found, start=1):
        source = folder / f"{page.stem}-{number}.mmd"
        source.write_text(text)
        png = out / f"{page.stem}-{number}.png"
        done = subprocess.run([str(program), "--quiet", "--input", str(source), "--output", str(png),
                               "--puppeteerConfigFile", str(browser), "--width", str(WIDTH), "--scale", str(SCALE),
                               "--backgroundColor", "white"],
                              capture_output=True, text=True, timeout=RENDER_SECONDS)
        if done.returncode != 0 or not png.exists():
            sys.exit(f"render_diagrams: {page}:{line}: mmdc exited {done.returncode}:\n{done.stderr or done.stdout}")
        print(f"{page}:{line} -> {png}")
        written.append(png)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("page", type=Path, help="the markdown page, e.g. docs/design.md")
    parser.add_argument("out", type=Path, help="the folder the PNGs are written to")
    args = parser.parse_args(argv)
    folder = Path(os.environ.get("MERMAID_CLI_DIR") or ROOT / ".run" / "mermaid-cli")
    render(args.page, args.out, folder.resolve())


if __name__ == "__main__":
    main()
