#!/bin/sh
# The CDK CLI's entry point (cdk.json "app"): the first Python that can import the CDK libraries,
# in this order: $TRAINGUARD_PYTHON, the active virtual environment, the repo's .venv (make
# setup), python3 on PATH. Any of them works; a clear message when none does.
cd "$(dirname "$0")/.." || exit 1
for py in "${TRAINGUARD_PYTHON:-}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" .venv/bin/python python3 python; do
  [ -n "$py" ] || continue
  command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
  if "$py" -c "import aws_cdk, cdk_nag, trainguard" >/dev/null 2>&1; then
    exec "$py" infra/app.py "$@"
  fi
done
echo "cdk: no Python with aws-cdk-lib, cdk-nag and trainguard installed." >&2
echo "     Run 'make setup' (creates .venv), or 'pip install -e \".[infra]\"' in your environment," >&2
echo "     or set TRAINGUARD_PYTHON=/path/to/python." >&2
exit 1
