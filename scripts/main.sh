#!/usr/bin/env bash
# Install vitexplain and run its main job: the default benchmark on the bundled `digits` data with the
# shipped ViT, digits_vit (vitexplain/bench/default_digits.yaml; `--model digits_vit --model digits_deit`
# adds the shipped DeiT). Writes vitexplain-bench/report.html and prints the tables. Extra arguments go to
# `vitexplain bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e .
vitexplain bench "$@"
