"""Collections: `vqa caption` / `vqa ask` over many images (folders, globs, lists, shards), JSON Lines out. `cli`
(the options and the run), `inputs` (the INPUTs as one sequence of positions), `loader` (images decoded in
DataLoader workers), `job` (the model run over them), `output` (the JSON Lines: resume, part files, merge; the
settings that make a record what it is)."""
