"""vqa.demo: the Gradio demo. `vqa demo` (or `python -m vqa.demo`) serves it; docs/layout.md lists its modules
by role (the command line in options, launching in server, the page in app, its tabs' handlers in handlers and
explorer). Only vqa/cli.py may import this package from inside vqa/.
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no telemetry calls from a local demo
