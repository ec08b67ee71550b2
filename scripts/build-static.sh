#!/bin/sh
# The one build of the static consumer binary. The Dockerfile runs it,
# `make static` and `make image` go through it, and
# cmd/consumer/image_test.go builds with it and runs the result, so the
# binary the test checks is built as the image's is.
#
#   scripts/build-static.sh OUTPUT    build ./cmd/consumer into OUTPUT
#   scripts/build-static.sh --version print the version it would stamp
#   scripts/build-static.sh --commit  print the commit it would stamp
#
# The binary is static (CGO_ENABLED=0: no libc, runs on a distroless or
# scratch base), without local paths (-trimpath) or debug information
# (-s -w). VERSION and COMMIT, when set and not empty, are stamped into it
# (`consumer version` prints them); otherwise git describe and git rev-parse
# give them in a git checkout, and elsewhere the binary reports what the Go
# toolchain recorded. GOOS and GOARCH choose the target as usual.
set -eu

case "${1:-}" in
"" | -h | --help)
	echo "usage: $0 OUTPUT | --version | --commit" >&2
	exit 2
	;;
-*) ;;
/*) out=$1 ;;
*) out=$PWD/$1 ;;
esac
cd "$(dirname "$0")/.."

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || true)}
commit=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || true)}
case "$1" in
--version) echo "$version"; exit 0 ;;
--commit) echo "$commit"; exit 0 ;;
-*) echo "$0: unknown flag $1" >&2; exit 2 ;;
esac

ldflags="-s -w"
[ -z "$version" ] || ldflags="$ldflags -X 'github.com/pgevents/pgevents/cmd/consumer/consumercli.version=$version'"
[ -z "$commit" ] || ldflags="$ldflags -X 'github.com/pgevents/pgevents/cmd/consumer/consumercli.commit=$commit'"
CGO_ENABLED=0 exec go build -trimpath -ldflags "$ldflags" -o "$out" ./cmd/consumer
