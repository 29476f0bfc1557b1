"""`python app.py [--checkpoint RUN] ...` in a source checkout: the same as `vqa demo` (its --help lists the flags)."""
from vqa.demo.server import main

if __name__ == "__main__":
    raise SystemExit(main())
