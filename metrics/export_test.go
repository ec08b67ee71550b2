package metrics

// StateSQL exposes the state statement to the tests' plan check.
const StateSQL = stateSQL
