"""The vqa demo (Gradio): upload a picture or pick an example, ask a question, caption it, see where the
model looked while it wrote each word, and follow its attention step by step in the attention explorer.

    python app.py                          # runs/tiny if it exists, else a page on how to train one
    python app.py --checkpoint runs/tiny [--host 0.0.0.0] [--port 7860] [--device cuda]
                  [--max-batch 16] [--batch-wait 2] [--concurrency 32] [--queue-size 64]

Serving. Questions and captions from all users go through one batching layer (`vqa.inference.serving`): the requests
that wait together (at most `--max-batch`; the first waits `--batch-wait` ms for company) are answered by one
batched model call, each distinct picture encoded once and its encoding cached by content. `--concurrency`
requests are worked on at once (default 2 x max-batch, so the next batch gathers while one runs) and at most
`--queue-size` more wait (default 2 x concurrency); beyond that a user is told the demo is busy. The answer
is sent as soon as it is there; its heatmap is drawn by a second, lighter event (through the API: only when
/heatmap is asked for), and the explorer's pictures only when its tab is opened. Uploads are capped at 10 MB
and pictures at `vqa.data.images.MAX_PIXELS` (64 megapixels); the server listens on 127.0.0.1 unless
`--host` says otherwise. Bad input (no picture, a file that is not a picture, a truncated or huge one, an
empty question) gets a message that names the file as the user called it, never a path on the server.

The model card says what the model was trained on; when the training pictures are on this machine, each
picture is compared with up to 256 of them (`vqa.demo.familiarity`) and an unusual one gets a warning with its
answer.

The demo lives in the package `vqa.demo` (server: the flags and launch; layout: the page; handlers and
explorer: what the buttons do; `python -m vqa.demo` is the same as this file). For tests and embedding:
`build_app(predictor_or_None, max_batch=...) -> gr.Blocks` and `serve(demo, host, port, concurrency,
queue_size)`, importable from here or from `vqa.demo.layout` / `vqa.demo.server`; the endpoints `/ask`,
`/caption`, `/heatmap`, `/explain` and `/export` keep their names for `gradio_client`.
"""

import sys

from vqa.demo.layout import build_app
from vqa.demo.server import main, serve

__all__ = ["build_app", "main", "serve"]

if __name__ == "__main__":
    sys.exit(main())
