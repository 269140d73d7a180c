# shellcheck shell=bash
# Helpers of the install, systemd and Docker tests (sourced; BUILD set).

# The variables of a calling make (`make test` or `make asan-test` pass BUILD
# and SAN on their command line, which reaches here through MAKEFLAGS) are
# kept, so that a nested make installs the tree that was just built and
# rebuilds nothing; the parent's job server is dropped, since its pipe is
# not passed down to this shell.
if [ -n "${MAKEFLAGS:-}" ]; then
  MAKEFLAGS=$(sed -E 's/(^| )--jobserver-(auth|fds)=[^ ]*//g; s/(^| )-j[0-9]*( |$)/ /g' <<<"$MAKEFLAGS")
  export MAKEFLAGS
fi

. tests/integration/lib_tally.sh

# make_install DESTDIR [VAR=VALUE...]: `make install` of $BUILD into DESTDIR.
make_install() {
  local dest=$1; shift
  BUILD=$BUILD make --no-print-directory -j1 install DESTDIR="$dest" "$@"
}

# free_port: a TCP port nobody listens on now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# same_as_chat_cpu FILE: FILE is config/examples/chat-cpu.yaml but for its
# comments, the socket folder, the model's folder and the HTTP address (what
# a deployment on a system or in an image must change); prints the
# difference otherwise.
same_as_chat_cpu() {
  diff <(grep -v '^ *#' config/examples/chat-cpu.yaml |
           sed -e 's#ipc:///tmp/baton/#ipc://DIR/#' -e 's#path: models/#path: MODELS/#' \
               -e 's#http_listen: .*#http_listen: ADDR#') \
       <(grep -v '^ *#' "$1" |
           sed -e 's#ipc:///run/baton/#ipc://DIR/#' -e 's#path: /var/lib/baton/models/#path: MODELS/#' \
               -e 's#http_listen: .*#http_listen: ADDR#')
}
