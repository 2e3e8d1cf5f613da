export RAYMT_SHARED_DATA=$PWD/data-gpu
timeout 200 python -m pytest -q -m gpu tests/workers -p no:cacheprovider 2>&1 | grep -E "passed|failed|Error|rows drew" | tail -15
