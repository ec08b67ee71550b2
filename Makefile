# pgevents: the two commands a fresh machine needs are `make demo` and
# `make test`. Both start a throwaway PostgreSQL from the server binaries on
# the machine unless DATABASE_URL (demo) or PGEVENTS_TEST_DATABASE_URL (tests)
# names a server.

GO ?= go
PKGS := ./...

.PHONY: all build static image test vet staticcheck demo bench clean schema

# The image deploy/k8s/deployment.yaml runs, and what `consumer version`
# reports: git describe and git rev-parse, computed by the build script.
IMAGE   ?= ghcr.io/pgevents/consumer
VERSION ?= $(or $(shell sh scripts/build-static.sh --version),dev)
COMMIT  ?= $(shell sh scripts/build-static.sh --commit)

all: build

# The production binary, and beside it consumer-dev (the same commands plus
# demo and bench, which bin/consumer hands to it).
build:
	$(GO) build -o bin/consumer ./cmd/consumer
	$(GO) build -o bin/consumer-dev ./cmd/consumer-dev

# The static binary the image ships (CGO_ENABLED=0, -trimpath, stamped with
# VERSION and COMMIT), built by the script the Dockerfile runs.
static:
	VERSION="$(VERSION)" COMMIT="$(COMMIT)" sh scripts/build-static.sh bin/consumer-static

# The container image, tagged with the version and latest. Needs a Docker
# engine; the base images are pulled from Docker Hub and gcr.io.
image:
	docker build --build-arg VERSION="$(VERSION)" --build-arg COMMIT="$(COMMIT)" \
		-t $(IMAGE):$(VERSION) -t $(IMAGE):latest .

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(GO) tool staticcheck $(PKGS)

# The packages whose tests create their topics through pgtest.TopicPool or
# pgeventstest.NewDB, in
# the offset scope PGEVENTS_TEST_OFFSET_SCOPE names: make test runs them a
# second time in scope 'partition'.
SCOPED_PKGS := . ./cmd/consumer/consumercli ./metrics ./offsets ./partition ./internal/lease ./console ./kafka

# go vet, staticcheck (pinned in go.mod as a tool) and the race-enabled tests
# against a real PostgreSQL, then the scoped suites again with partition-scoped
# offsets.
test: vet staticcheck
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	PGEVENTS_TEST_OFFSET_SCOPE=partition $(GO) test -race -count=1 -timeout 20m $(SCOPED_PKGS)

# schema/current/*.sql: every table, view and function as the migrations
# leave it, one file per concern, read back from a freshly migrated database.
# make test fails (TestCurrentSchema) when a migration changes the schema and
# these files were not regenerated.
schema:
	$(GO) test -count=1 -run '^TestCurrentSchema$$' ./schema -update

# Producers and a consumer group against a local PostgreSQL kept under
# .pgevents-demo/ (or DATABASE_URL); prints live progress, stops by itself.
demo:
	$(GO) run ./cmd/consumer-dev demo

# The benchmark table (see BENCHMARKS.md).
bench:
	$(GO) run ./cmd/consumer-dev bench

# As root in a directory the postgres user cannot enter, the demo's cluster
# lives elsewhere and .pgevents-demo/pg links to it: remove it too.
clean:
	@t=$$(readlink .pgevents-demo/pg 2>/dev/null); case "$$t" in */pgcluster-*) echo "rm -rf $$t"; rm -rf "$$t";; esac
	rm -rf bin .pgevents-demo
