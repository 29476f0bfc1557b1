# Two commands do all the set-up on a fresh machine:
#   make demo   build the Shapes data, train the tiny model, evaluate it, and serve the app
#   make test   run the test suite
# and one that is not part of make test (too slow):
#   make mutation   mutation testing of the modules in pyproject's [tool.mutmut] (docs/testing.md)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DATA   ?= data/shapes
RUN    ?= runs/tiny
TIME   ?= 10m
JOBS   ?= 2
# mutant names to run, e.g. MUTANTS='vqa.data.collate*' (empty: all of [tool.mutmut]'s modules)
MUTANTS ?=
STAMP  := $(VENV)/.installed

.PHONY: demo test install lint bench mutation clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# the package takes ranges; the tests run at the versions CI pins
	$(PY) -m pip install -q -e '.[dev]' -c constraints.txt
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

mutation: $(STAMP)
	@# mutmut writes the mutated copy to mutants/ and resumes where an interrupted run stopped
	@# one torch thread per mutant process: JOBS processes share the cores
	OMP_NUM_THREADS=1 $(VENV)/bin/mutmut run --max-children $(JOBS) $(MUTANTS)
	$(VENV)/bin/mutmut results
	$(PY) scripts/mutation_scores.py

lint: $(STAMP)
	$(VENV)/bin/ruff check vqa tests scripts app.py

demo: $(STAMP)
	@# shapes_info.json is written last: its absence means the set is missing or was interrupted
	@test -f $(DATA)/shapes_info.json || $(VENV)/bin/vqa data shapes --out $(DATA)
	@# .done marks a finished run; an interrupted one continues where it stopped (--resume)
	@test -f $(RUN)/.done || \
		( $(VENV)/bin/vqa train --data $(DATA) --out $(RUN) --preset tiny --time-limit $(TIME) --resume && touch $(RUN)/.done )
	$(VENV)/bin/vqa eval --checkpoint $(RUN) --data $(DATA) --split val
	@# the steps this machine reached in $(TIME), and the --max-steps command that repeats them anywhere
	@cat $(RUN)/max_steps_command.txt 2>/dev/null || true
	$(VENV)/bin/vqa demo --checkpoint $(RUN)

bench: $(STAMP)
	$(PY) scripts/bench.py

clean:
	rm -rf $(VENV) .pytest_cache mutants
