package relay

import (
	"context"
	"testing"

	"github.com/fxoutbox/outbox/internal/testenv"
)

// The parked gauge counts parked events by topic and by the error.type the
// relay stored at the start of last_error (through the admin API, whose
// plan test checks the statement reads only the partial index): with 50k
// rows of which 50 are parked over 7 topics, 7 groups of that reason.
func TestParkedGaugeGroupsByTopicAndReason(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "INSERT INTO "+tbl.Ident()+
		" (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, published_at, parked_at, last_error)"+
		" SELECT gen_random_uuid(), 'a', 'k' || (g % 500), 'a.b', '{}', 't' || (g % 7), 'k' || (g % 500),"+
		" CASE WHEN g % 1000 <> 7 THEN now() END, CASE WHEN g % 1000 = 7 THEN now() END, CASE WHEN g % 1000 = 7 THEN '[kafka.message_too_large] permanent: x' END"+
		" FROM generate_series(1, 50000) g")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+tbl.Ident()); err != nil {
		t.Fatal(err)
	}
	r, err := New(pool, PublisherFunc(func(context.Context, []Message) error { return nil }), &Config{Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.queryTableStats(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, g := range st.parked {
		if g.reason != "kafka.message_too_large" {
			t.Errorf("parked group %+v, want reason kafka.message_too_large", g)
		}
		n += g.n
	}
	if n != 50 || len(st.parked) != 7 {
		t.Errorf("parked groups %+v: %d events in %d groups, want 50 in 7 (one per topic)", st.parked, n, len(st.parked))
	}
}
