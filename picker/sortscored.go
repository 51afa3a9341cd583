package picker

import "slices"

// sortScored sorts cands exactly as slices.SortFunc (stable: slices.SortStableFunc) would — the same algorithm
// on the same comparisons, so the same order — but moves the candidates' positions instead of the candidates.
// A candidate's record is about 500 bytes (scored), and the sorting functions keep copies of elements in their
// frames: sorting the records grew every decision's goroutine stack by several kilobytes per level, and a
// stream's goroutine copied its stack to a larger one on nearly every request.
func sortScored(cands []scored, stable bool, cmp func(a, b *scored) int) {
	if len(cands) < 2 {
		return
	}
	var room [64]int32
	perm := room[:0]
	if len(cands) > len(room) {
		perm = make([]int32, 0, len(cands))
	}
	for i := range cands {
		perm = append(perm, int32(i))
	}
	byPosition := func(i, j int32) int { return cmp(&cands[i], &cands[j]) }
	if stable {
		slices.SortStableFunc(perm, byPosition)
	} else {
		slices.SortFunc(perm, byPosition)
	}
	permute(cands, perm)
}

// permute rearranges s so that s[k] becomes the old s[perm[k]], following each cycle of the permutation with one
// record held aside; perm ends as the identity.
func permute(s []scored, perm []int32) {
	for i := range perm {
		if perm[i] == int32(i) {
			continue
		}
		held := s[i]
		j := int32(i)
		for {
			k := perm[j]
			perm[j] = j
			if k == int32(i) {
				s[j] = held
				break
			}
			s[j] = s[k]
			j = k
		}
	}
}
