"""``python -m horo.run``: same as the ``hororun`` command."""

from horo.run import main

if __name__ == "__main__":
    raise SystemExit(main())
