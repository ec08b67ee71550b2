package metrics

import "github.com/pgevents/pgevents/schema"

// StateSQL exposes the state statement to the tests' plan check, for
// pgevents in the first schema of the search_path.
var StateSQL = schema.Qualify("", stateSQL)
