"""The README opens with a picture of the live dashboard that matches today's dashboard code
(tests/dashboard_picture.py says how the browser tier makes and stamps it)."""
import os

import dashboard_picture as pic


def test_readme_shows_the_dashboard_picture():
    assert os.path.getsize(os.path.join(pic.REPO, pic.PICTURE)) > 10_000
    with open(os.path.join(pic.REPO, "README.md")) as f:
        head = f.read().split("\n## ", 1)[0]  # before the first section
    assert f"]({pic.PICTURE})" in head, "the picture is not in the README's opening"


def test_the_picture_is_of_todays_dashboard():
    assert pic.stamped_digest() == pic.look_digest(), (
        f"the dashboard's look changed ({', '.join(pic.LOOK)}) since {pic.PICTURE} was taken: "
        "run `./dev.sh test tests/browser` outside CI (it replaces the picture and "
        f"{pic.STAMP}) and commit both")
