package outboxtest_test

// raceEnabled is set when the tests run with -race, so the pasted examples
// run with it too.
var raceEnabled bool
