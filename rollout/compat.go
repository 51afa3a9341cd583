package rollout

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

// EngineView is the scraper's latest reading of each engine (fleet.Scraper).
type EngineView interface {
	Metrics(addr string) (fleet.EngineMetrics, bool)
}

// maxModelList bounds the /v1/models answer read from an engine.
const maxModelList = 1 << 20

// checker runs the compatibility gate: before the first step, every engine that would serve the candidate
// must be healthy (fresh metrics), list the candidate's model in its /v1/models, and report the expected
// engine version when the plan names one.
type checker struct {
	engines EngineView // nil: engines are not scraped, health is not judged
	client  *http.Client
}

// check returns nil when the candidate may take traffic, otherwise what is wrong.
func (c checker) check(ctx context.Context, plan *policies.RolloutPlan) error {
	pools := plan.Baseline // a served-model candidate runs on the baseline's engines
	if plan.Candidate != nil {
		pools = []*policies.Pool{plan.Candidate}
	}
	want := plan.Compatibility
	for _, p := range pools {
		for _, ep := range p.Endpoints {
			var m fleet.EngineMetrics
			if c.engines != nil {
				var fresh bool
				if m, fresh = c.engines.Metrics(ep); !fresh {
					return fmt.Errorf("endpoint %s of pool %s has no fresh metrics", ep, p.Name)
				}
			}
			if want.EngineVersion != "" && m.Version != want.EngineVersion {
				return fmt.Errorf("endpoint %s of pool %s reports engine version %q, want %q", ep, p.Name, m.Version, want.EngineVersion)
			}
			if want.Model == "" {
				continue
			}
			ids, err := c.models(ctx, ep)
			if err != nil {
				return fmt.Errorf("endpoint %s of pool %s: %w", ep, p.Name, err)
			}
			if !slices.Contains(ids, want.Model) {
				return fmt.Errorf("endpoint %s of pool %s does not serve %q (it lists %d models)", ep, p.Name, want.Model, len(ids))
			}
		}
	}
	return nil
}

// models asks an engine which models it serves.
func (c checker) models(ctx context.Context, ep string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/models answered %d", resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxModelList+1))
	if err != nil {
		return nil, err
	}
	return parseModelList(b)
}

// parseModelList reads the ids of an OpenAI model list.
func parseModelList(b []byte) ([]string, error) {
	if len(b) > maxModelList {
		return nil, fmt.Errorf("model list over %d bytes", maxModelList)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("model list: %w", err)
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids, nil
}
