#!/usr/bin/env bash
# `make demo`: the whole cooperative-learning experiment on a tiny model with the embedded
# SQLite store, then an independent verification, an export and an offline checksum check.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${NSCAS_DEMO_DIR:-demo-out}
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)  # absolute, whether NSCAS_DEMO_DIR was given relative or not
export NSCAS_STORE="$work/.nscas"
start=$(date +%s)

nscas init "$work"
# A throwaway signing key in the work dir: every receipt of the run is signed with it.
nscas key new "$work/keys/demo.key" > /dev/null
echo "== running examples/cooperative-learning/experiment.toml (receipts signed)"
nscas run examples/cooperative-learning/experiment.toml --sign-key "$work/keys/demo.key"
produced=$(( $(date +%s) - start ))

echo "== the same file again: every step is a cache hit"
nscas run examples/cooperative-learning/experiment.toml --json > "$work/rerun.json"
report=$(python3 -c "
import json, sys
steps = json.load(open(sys.argv[1]))
assert all(s['cached'] for s in steps), 'a second run was not a cache hit'
print(steps[-1]['receipt'])
" "$work/rerun.json")
echo "all steps cached; report receipt $report"

echo "== independent verification of the report and everything it rests on"
vstart=$(date +%s)
nscas verify "$report"
verified=$(( $(date +%s) - vstart ))

echo "== replay: 8 answers per evaluated arm and every retention probe, from the committed weights"
nscas verify "$report" --replay 8 --replay-seed 20261201 --failures-only

echo "== publication bundle, checked offline"
nscas export "$report" "$work/bundle"
(cd "$work/bundle" && sha256sum -c --quiet SHA256SUMS && echo "sha256sum -c SHA256SUMS: OK")
# What a publisher prints beside the bundle: the SHA-256 of its SHA256SUMS, which pins it.
sums=$(sha256sum "$work/bundle/SHA256SUMS" | cut -d' ' -f1)
NSCAS_STORE= nscas verify "$work/bundle" --strict --expect "$sums" \
    --trust "$work/keys/demo.key.pub" > /dev/null \
  && echo "nscas verify $work/bundle --strict --expect $sums --trust demo.key.pub: OK (no store;" \
          "every receipt signed by the demo key)"

nscas lineage "$report" --depth 1
echo "== done: experiment ${produced}s, verification ${verified}s"
# The next commands, to paste into a shell of one's own: this script's PATH and store are not
# there (tests/docs runs these lines as printed).
echo "== to look around, paste these two lines into your shell (README.md, 'A short tour'):"
printf 'export PATH=%q:"$PATH" NSCAS_STORE=%q\n' "$(dirname "$(command -v nscas)")" "$NSCAS_STORE"
printf 'nscas get experiments/coop/report %q && ls %q\n' "$work/report" "$work/report"
