# Sourced by scripts/test and scripts/example: make .venv and install the project into it with
# the extras both need (test; embedded: the throwaway PostgreSQL of the example and the tests).
# The runtime libraries are held to the versions of constraints/runtime.txt, the test and lint
# tools to those of constraints/test.txt: what CI tested.
# Reinstalls only when setup.cfg, pyproject.toml, the constraints or this file is newer than the
# stamp.
PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.installed"

if [ ! -x "$VENV/bin/python" ]; then
    echo "scripts: creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
    rm -f "$STAMP"
fi

needs_install=0
if [ ! -f "$STAMP" ]; then
    needs_install=1
else
    for f in setup.cfg pyproject.toml constraints/runtime.txt constraints/test.txt scripts/_venv.sh; do
        if [ -f "$f" ] && [ "$f" -nt "$STAMP" ]; then
            needs_install=1
        fi
    done
fi

if [ "$needs_install" = 1 ]; then
    echo "scripts: installing the project into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -c constraints/runtime.txt -c constraints/test.txt -e '.[test,demo,dev]'
    touch "$STAMP"
fi
