package quota

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/infergate/infergate/policies"
)

// A gateway restarted after a crash would otherwise wait out ConcurrencyTTL before its tenants' slots of the
// previous run free. With an instance id that survives the restart (a Kubernetes pod's name), every slot this
// gateway takes is named after it, and Reclaim removes the previous run's at start.

// ticketID names a new reservation: after the instance id, when there is one, so Reclaim can find it.
func (l *Limiter) ticketID() string {
	if l.instance == "" {
		return rand.Text()
	}
	return l.instance + ":" + rand.Text()
}

// Reclaim frees the concurrency slots a previous run of this gateway instance left in Redis, for every
// concurrency limit of the policy, and returns how many it freed. Call it once at start, before serving;
// without an instance id it does nothing.
func (l *Limiter) Reclaim(ctx context.Context, snap *policies.Snapshot) (int, error) {
	if l.instance == "" {
		return 0, nil
	}
	freed := 0
	for _, key := range concurrencyKeys(snap) {
		var cursor uint64
		for {
			members, next, err := l.redis.client.ZScan(ctx, key, cursor, l.instance+":*", 512).Result()
			if err != nil {
				return freed, fmt.Errorf("reclaim %s: %w", key, err)
			}
			var names []any
			for i := 0; i < len(members); i += 2 { // member, score pairs
				names = append(names, members[i])
			}
			if len(names) > 0 {
				n, err := l.redis.client.ZRem(ctx, key, names...).Result()
				if err != nil {
					return freed, fmt.Errorf("reclaim %s: %w", key, err)
				}
				freed += int(n)
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return freed, nil
}

// concurrencyKeys lists the Redis keys of every concurrency limit in the policy.
func concurrencyKeys(snap *policies.Snapshot) []string {
	var out []string
	for i := range snap.Policy.Spec.Tenants {
		t := &snap.Policy.Spec.Tenants[i]
		prefix := "ig:" + tag(t.Name) + ":"
		if t.Quota.MaxConcurrent > 0 {
			out = append(out, prefix+"tenant:conc")
		}
		for _, mq := range t.ModelQuotas {
			if m, ok := snap.Model(mq.Model); ok && mq.MaxConcurrent > 0 {
				out = append(out, prefix+"model:"+m.Name+":conc")
			}
		}
	}
	return out
}
