"""The README's picture of the live dashboard, ``docs/pages/img/dashboard.png``.

The browser tier takes it from a real run (two ranks training in JupyterLab) and stamps it with a
digest of the code that draws the dashboard (``LOOK``). When that code changes the stamp no
longer matches: a local browser run replaces the picture and the stamp (commit both), and
``tests/unit/test_readme_picture.py`` fails until that happened. CI never writes the picture: a
clean clone's run must find the committed one current.
"""
import hashlib
import os
import shutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PICTURE = os.path.join("docs", "pages", "img", "dashboard.png")
STAMP = os.path.join("docs", "pages", "img", "dashboard.look")
# What decides how the dashboard looks: its widget tree and CSS, the sparklines and strips, the
# texts of the world/autotune panels, the number formats.
LOOK = ("widgets/view.py", "widgets/sparkline.py", "widgets/text.py", "widgets/fmt.py")


def look_digest() -> str:
    h = hashlib.sha256()
    for rel in LOOK:
        with open(os.path.join(REPO, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def stamped_digest() -> str | None:
    try:
        with open(os.path.join(REPO, STAMP)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def refresh(screenshot: str) -> bool:
    """Copy ``screenshot`` over the README's picture when the stamp is stale (not under CI);
    True when it did."""
    if os.environ.get("CI") or stamped_digest() == look_digest():
        return False
    shutil.copyfile(screenshot, os.path.join(REPO, PICTURE))
    with open(os.path.join(REPO, STAMP), "w") as f:
        f.write(look_digest() + "\n")
    return True
