#!/usr/bin/env bash
# Copy the generated PerfDiagnosis CRD into the Helm chart (charts/perfdiag/crds/) and crds/.
# tests/chart/test_chart.py fails while the chart's copy differs from `perfdiag crd`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/perfdiag crd --output crds/perfdiagnosis.yaml
cp crds/perfdiagnosis.yaml charts/perfdiag/crds/perfdiagnosis.yaml
echo "charts/perfdiag/crds/perfdiagnosis.yaml updated" >&2
