"""The procedural data sets, written as VQA v2 + COCO captions: Shapes (`shapes`), Scenes (`scenes`), Glyphs
(`glyphs`) and the pretraining corpus (`corpus`). Each set is four files: the set itself, its `_layout` (what a
scene holds and where things go), its `_render` (the drawing) and its `_text` (questions and captions); Glyphs
adds `_font` (one character's ink); `generator` holds what they share (question families, answer balancing,
the build and the writer)."""
