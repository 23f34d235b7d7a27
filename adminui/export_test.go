package adminui

// The pages' data and the bulk actions' JSON, under the names the tests
// decode the JSON twins into. They are not part of the public API: their
// JSON is (docs/adminui.md).
type (
	Overview       = overviewPage
	TableOverview  = tableOverview
	Chart          = chartData
	InboxOverview  = inboxOverview
	Filter         = eventFilter
	ParkedGroupRow = parkedGroupRow
	Event          = eventRow
	ParkedPage     = parkedPage
	EventPage      = eventPage
	InboxPage      = inboxPage
	InboxFilter    = inboxFilter
	RecordPage     = recordPage
	ActionRequest  = actionRequest
	Job            = bulkJob
)
