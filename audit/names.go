package audit

import (
	"crypto/sha256"
	"encoding/hex"
)

const (
	// maxNameLen is the longest tenant name used as a directory name as it is.
	maxNameLen = 128
	// escapedPrefix starts the directory name of a tenant whose name is not safe to use. '+' is outside the
	// characters a safe name may hold, so an escaped name can never equal a real tenant's directory, even on a
	// case-insensitive file system.
	escapedPrefix = "x+"
)

// dirName is the directory, under Options.Dir, of a tenant's files. Tenant names come from the policy, but they
// are treated as outside input here: a name matching ^[a-z0-9._-]{1,128}$ other than "." and ".." is used as it
// is; any other name (empty, upper case, a separator, "..", control or non-ASCII characters, too long) becomes
// "x+" and the hex of the first 16 bytes of its SHA-256, which is stable across runs and one path component.
func dirName(tenant string) string {
	if safeName(tenant) {
		return tenant
	}
	sum := sha256.Sum256([]byte(tenant))
	return escapedPrefix + hex.EncodeToString(sum[:16])
}

// safeName reports whether a tenant name can be its own directory name.
func safeName(s string) bool {
	if len(s) == 0 || len(s) > maxNameLen || s == "." || s == ".." {
		return false
	}
	for i := range len(s) {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
