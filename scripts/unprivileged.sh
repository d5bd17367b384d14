#!/usr/bin/env bash
# Run pytest as an ordinary user, the way a researcher runs JupyterLab: `bash scripts/unprivileged.sh -m isolation`.
# scripts/test.sh runs the sandbox, quota, identity and escape tests (marker `isolation`) a second time this way
# when CI runs as root. Run by someone else, it is plain pytest.
#
# As root it makes (once) a user `wbunpriv`, then runs pytest as that user with no capability, in a mount namespace
# of its own where any directory on the way to this checkout or its Python that others cannot enter (say, a 0700
# /root holding pyenv) is covered by an empty one they can, with just those trees bound back: nothing else of the
# machine changes, and nothing of it outlives the run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec .venv/bin/python -m pytest -p no:cacheprovider "$@"

who=wbunpriv
id -u "$who" >/dev/null 2>&1 || useradd --create-home --user-group --shell /usr/sbin/nologin "$who"
uid=$(id -u "$who"); gid=$(id -g "$who"); home=$(getent passwd "$who" | cut -d: -f6)
run=$(mktemp -d /tmp/wbu.XXXXXX)  # short: a socket path under it must fit in 107 bytes
chown "$uid:$gid" "$run"
trap 'rm -rf "$run"' EXIT
repo=$(pwd -P)
prefix=$(.venv/bin/python -c 'import sys; print(sys.base_prefix)')
base=$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys._base_executable))')

# the first directory on the way to each tree that others may not enter, and the trees under it to bind back
blocked=$(.venv/bin/python - "$repo" "$prefix" "$(dirname "$base")" <<'EOF'
import os, sys
found = {}
for tree in sys.argv[1:]:
    parts = os.path.realpath(tree).split("/")[1:]
    for i in range(1, len(parts)):
        d = "/" + "/".join(parts[:i])
        if not os.stat(d).st_mode & 0o001:
            found.setdefault(d, set()).add(os.path.realpath(tree))
            break
for d, trees in found.items():
    print(d, *sorted(trees))
EOF
)

inner=$(cat <<'EOF'
set -euo pipefail
while read -r dir trees; do
  [ -n "$dir" ] || continue
  hold=$(mktemp -d /tmp/wb-hold.XXXXXX)
  mount --bind "$dir" "$hold"
  mount -t tmpfs -o mode=0711,size=1m wb-cover "$dir"
  for t in $trees; do
    mkdir -p "$t"
    mount --bind "$hold/${t#"$dir"/}" "$t"
  done
done <<< "$BLOCKED"
cd "$REPO"
exec setpriv --reuid="$WB_UID" --regid="$WB_GID" --init-groups --inh-caps=-all -- \
  env -i HOME="$WB_HOME" USER=wbunpriv LOGNAME=wbunpriv PATH=/usr/local/bin:/usr/bin:/bin TMPDIR="$WB_RUN" \
  LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 CI="${CI:-}" .venv/bin/python -m pytest -p no:cacheprovider "$@"
EOF
)
BLOCKED="$blocked" REPO="$repo" WB_UID="$uid" WB_GID="$gid" WB_HOME="$home" WB_RUN="$run" \
  unshare --mount --propagation private -- bash -c "$inner" unprivileged "$@"
