"""The demo's events: each tab's components (`vqa.demo.ask_tab`, `vqa.demo.explorer_tab`) bound to their
handlers (`vqa.demo.handlers.Handlers`, `vqa.demo.explorer.Explorer`). `vqa.demo.app` builds the tabs, then
calls `wire_ask_tab` and `wire_explorer_tab`.

The endpoints `/ask`, `/caption`, `/point`, `/heatmap`, `/explain` and `/export` keep their names for
`gradio_client`.
"""

from __future__ import annotations

import gradio as gr

from .ask_tab import AskTab, shown_for
from .explorer import Explorer
from .explorer_tab import ExplorerTab
from .find import Finder
from .handlers import Handlers
from .streaming import streaming_ask, streaming_caption


def wire_ask_tab(t: AskTab, handlers: Handlers, state: gr.State) -> None:
    """The "Ask and caption" tab's events: /ask, /caption, /point (the Find tab) and /heatmap, the heatmap drawn
    after each answer, and the decoding controls shown for the method chosen."""
    # the answer is shown as soon as it is there; its heatmap is drawn by a second, lighter event (and
    # through the API only when /heatmap is asked for)
    heat_args = dict(fn=handlers.heatmap, inputs=[t.word, t.layer, t.head, state], outputs=t.heat,
                     concurrency_id="heatmap", concurrency_limit=4, show_progress="hidden")
    gr.on([t.word.input, t.layer.input, t.head.input], **heat_args, api_name="heatmap")
    # a failed request clears the heatmap: it would show the previous picture's beside the error
    # the answer and the caption fill in as they are decoded (vqa.demo.streaming); Stop cancels them
    asked = gr.on([t.ask_btn.click, t.question.submit], streaming_ask(handlers), [t.image, t.question, t.top_k, state],
                  [t.answer, t.scores, t.word, t.note, state], api_name="ask", concurrency_id="model")
    asked.success(**heat_args, api_name="heatmap_after_ask", api_visibility="private")
    asked.failure(lambda: None, None, t.heat, api_visibility="private", queue=False)
    t.method.change(lambda m: [gr.update(visible=v) for v in shown_for(m)], t.method, t.settings,
                    api_visibility="private", queue=False)
    captioned = t.cap_btn.click(streaming_caption(handlers), [t.image, t.method, *t.settings, state],
                                [t.cap_text, t.cap_details, t.word, state], api_name="caption",
                                concurrency_id="model")
    captioned.success(**heat_args, api_name="heatmap_after_caption", api_visibility="private")
    captioned.failure(lambda: None, None, t.heat, api_visibility="private", queue=False)
    gr.on([t.ask_stop.click, t.cap_stop.click], None, None, None, cancels=[asked, captioned],
          api_visibility="private", queue=False)
    finder = Finder(handlers.pred, handlers.budget)  # the Find tab: Predictor.point, drawn on the picture
    gr.on([t.find_btn.click, t.find_object.submit], finder.find, [t.image, t.find_object],
          [t.found_picture, t.found_line], api_name="point", concurrency_id="model")


def wire_explorer_tab(t: ExplorerTab, explorer: Explorer, state: gr.State, explained: gr.State) -> None:
    """The attention explorer tab's events: /explain (the button, or opening the tab) and /export, and the
    redraws."""
    views = [t.self_img, t.cross_img, t.qk_img, t.vit_img]
    selectors = [t.token, t.layer, t.head]
    gr.on([t.explain_btn.click, t.tab.select], explorer.explain, [state],
          [explained, *selectors, t.row, t.col, t.info, *views, t.cross], api_name="explain",
          concurrency_id="explain", concurrency_limit=2)
    gr.on([t.layer.input, t.head.input, t.cross.input], explorer.redraw_self, [explained, *selectors, t.cross],
          [t.self_img, t.qk_img], concurrency_id="explain", api_visibility="undocumented")
    t.token.input(explorer.redraw_token, [explained, *selectors, t.cross],
                  [t.cross_img, t.qk_img, t.vit_img, t.row, t.col], concurrency_id="explain",
                  api_visibility="undocumented")
    gr.on([t.row.release, t.col.release], explorer.redraw_patch, [explained, t.row, t.col], t.vit_img,
          concurrency_id="explain", api_visibility="undocumented")
    t.export_btn.click(explorer.export, [explained, *selectors, t.row, t.col, t.cross], t.files, api_name="export",
                       concurrency_id="explain")
