#!/usr/bin/env bash
# Regenerates docs/locks-page.png: the payments example's /locks/page (`--work-ms 50
# --journal 2000`, eight clients crediting account 7 at once) as headless Chromium draws it
# at 1280x800. `.ci/browser-test` does the work and checks the page on the way; it installs
# Debian's chromium if missing. Usage:
#   bash scripts/locks-page-picture.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/browser-test --screenshot docs/locks-page.png
