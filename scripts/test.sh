#!/usr/bin/env bash
# Install vitexplain with its test extras, lint, build the documentation site and run the test suite (the README's
# test command; CI runs it too).
set -euo pipefail
cd "$(dirname "$0")/.."
# the HTML report test drives Debian's headless Chromium
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "scripts/test.sh: install chromium and chromium-driver (e.g. apt-get install chromium chromium-driver)" >&2
  fi
fi
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
# lint first (config in pyproject.toml [tool.ruff]): a lint error stops the run before the tests
python3 -m ruff check .
# the documentation site (mkdocs.yml): a broken link, a missing page or a missing API object fails the build
site_dir="$(mktemp -d)"
trap 'rm -rf "$site_dir"' EXIT
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --quiet --site-dir "$site_dir"
# two workers, each test file whole in one of them (its module fixtures built once): the suite's files are
# independent, and on the 2-core CI machine this halves the wall time; the files in the order tests/conftest.py
# gives them (the longest first), not re-sorted by their number of tests (docs/decisions/performance.md)
python3 -m pytest -n "${VITEXPLAIN_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
