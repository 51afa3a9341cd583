package director

import (
	"errors"
	"fmt"

	"github.com/infergate/infergate/picker"
)

// Reason says why Route refused a request.
type Reason int

// The reasons Route refuses a request.
const (
	ModelNotFound  Reason = iota + 1 // the policy has no such model (or alias, or adapter)
	ModelForbidden                   // the tenant may not use it
	OutputTooLarge                   // max_tokens beyond the model's context
	OverQuota                        // a quota refused it: Err is the *quota.Rejection
	QuotaFailed                      // the quota stage could not decide: Err is quota.ErrUnavailable or the failure
	NoCapacity                       // no endpoint and no fallback can take it: Err is the *picker.NoCapacity
	ClientGone                       // the client went away while the request waited for room
	TooManyChoices                   // n (or best_of) beyond the policy's spec.gateway.maxChoices
)

// Refusal is Route's neutral error: what was refused and why, in the stages' terms. The protocol stage maps it
// to the client's answer.
type Refusal struct {
	Reason Reason
	Model  string // as the client named it, or the canonical model once resolved
	Tenant string
	// MaxTokens and ContextTokens describe an OutputTooLarge.
	MaxTokens, ContextTokens int64
	// Choices and MaxChoices describe a TooManyChoices.
	Choices, MaxChoices int64
	// Err is the stage's own error (quota, picker).
	Err error
}

func (r *Refusal) Error() string {
	switch r.Reason {
	case ModelNotFound:
		return fmt.Sprintf("model %q not found", r.Model)
	case ModelForbidden:
		return fmt.Sprintf("tenant %s may not use model %s", r.Tenant, r.Model)
	case OutputTooLarge:
		return fmt.Sprintf("max_tokens %d beyond the context of %s (%d)", r.MaxTokens, r.Model, r.ContextTokens)
	case TooManyChoices:
		return fmt.Sprintf("%d sequences asked, at most %d allowed", r.Choices, r.MaxChoices)
	}
	return fmt.Sprintf("%s for %s: %v", r.reasonName(), r.Model, r.Err)
}

func (r *Refusal) reasonName() string {
	switch r.Reason {
	case OverQuota:
		return "over quota"
	case QuotaFailed:
		return "quota unavailable"
	case NoCapacity:
		return "no capacity"
	case ClientGone:
		return "client gone while queued"
	}
	return "refused"
}

// outcome is the refusal's class in SLO reports.
func (r *Refusal) outcome() string {
	switch r.Reason {
	case OverQuota:
		return OutcomeQuota
	case QuotaFailed:
		return OutcomeUnavailable
	case ClientGone:
		return OutcomeReset
	case NoCapacity:
		var nc *picker.NoCapacity
		if errors.As(r.Err, &nc) && nc.Saturated {
			return OutcomeSaturated
		}
		return OutcomeUnavailable
	}
	return OutcomeClientError
}

// Unwrap exposes the stage's error.
func (r *Refusal) Unwrap() error { return r.Err }
