//go:build fallbackroots

package main

// The container image (make image) has no operating system, so no CA bundle: built with this tag, the binary
// carries Mozilla's roots and uses them when the system offers none (TLS to Redis, an OTLP collector, the
// Kubernetes API are then verified as on any host).
import _ "golang.org/x/crypto/x509roots/fallback"
