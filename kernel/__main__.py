"""``python -m hvd_magic.kernel install|uninstall ...`` manages the kernelspec;
``python -m hvd_magic.kernel -f CONNECTION_FILE`` (what the kernelspec runs) starts the kernel."""

import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("install", "uninstall", "-h", "--help"):
        from .kernelspec import main as manage
        return manage(argv)
    from .kernel import launch
    launch(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
