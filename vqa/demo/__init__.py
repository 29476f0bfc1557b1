"""vqa.demo: the Gradio demo, by role. `vqa demo` (or `python -m vqa.demo`) serves it.

    options.py      the command line: flags, defaults, their checks and queue sizes (light: no gradio)
    server.py       the entry point: loading the Predictor, launch (`serve`)
    app.py          the page assembled (`build_app`): the batching layer, the familiarity reference, the tabs;
                    without a model, the page that says how to train one
    ask_tab.py      the Ask / Caption / Model card tab's components
    explorer_tab.py the attention explorer tab's components
    events.py       both tabs' wiring: their components bound to the handlers (the endpoints' names)
    explorer.py     the attention explorer's handlers (callable without a server) and its explanations kept
    handlers.py     the Ask / Caption / heatmap handlers as plain methods (callable without a server)
    uploads.py      the picture input: uploads that keep the user's file name, messages without server paths
    card.py         the model card, what the model was trained on and the familiarity reference
    examples.py     the example pictures (vqa/samples, shipped; data/shapes when built) and their questions
    familiarity.py  is a picture like the training pictures? (the warning for unusual pictures)

Only vqa/cli.py may import this package from inside vqa/.
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no telemetry calls from a local demo
