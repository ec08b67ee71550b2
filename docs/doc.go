// Package docs holds pgevents' documentation beyond the README: the
// reference of the configuration file and of the consumer command
// (reference.md). It has no code; its tests keep the documents honest, and
// run with every `go test ./...` (so in `make test`):
//
//   - Links: every relative link and image of README.md and docs/*.md
//     names a file or directory that exists, and its #anchor a heading of
//     the Markdown file it points to, by GitHub's rules (lowercase, spaces
//     to '-', punctuation dropped, a repeated heading's anchor suffixed -1,
//     -2...).
//   - Go code blocks: a block fenced ```go is compiled. A block that
//     starts with a package clause is a complete file and must build and
//     pass go vet as it is. Any other ```go block is a fragment: it is
//     compiled in a file of its own (its top-level functions as they are,
//     other code as a function's body), with imports added for the
//     packages it names (pgevents, pgx, consumercli...), and every error
//     fails but those of what the fragment leaves to its reader: names it
//     does not define (ctx, pool, tx), variables it does not use. Code
//     that is not meant to compile (pseudo-code, a sketch) is fenced
//     ```text, not ```go.
//   - The commands: every command of the consumer binary and every flag
//     of its flag set is documented under reference.md#commands, with the
//     flag's default, and every command and flag documented there exists.
//     The commands are read from the binary's usage, and their flags from
//     what `consumer <command> -h` prints.
//   - Runnable blocks: a ```sh block that an HTML comment marks
//     runnable, on the line before its fence, is run as written
//     (TestRunnableBlocks), document by document, in a scratch copy of the
//     repository, with the consumer binary on the PATH, on a fresh
//     database of the throwaway cluster (the example URL
//     postgres://postgres@127.0.0.1:5432/postgres and DATABASE_URL name
//     it) and a free port for Kafka's 9092. <!-- runnable --> must exit 0;
//     <!-- runnable: background --> is a server (consumer run, consumer
//     kafka) that runs until the document's last block ran, then gets
//     SIGINT and must exit 0; <!-- runnable: expect TEXT --> is run again
//     until it exits 0 printing TEXT, within a minute. docs/deploying.md's
//     blocks marked <!-- runnable: sandbox --> install files under /etc
//     and run systemctl: the consumercli tests run them in a sandbox.
//
// The configuration keys are checked by the config package's tests
// against the same reference.
//
// Failures name the file and line of the link, block or row at fault.
package docs
