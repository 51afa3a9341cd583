// Package helm holds the tests of the infergate Helm chart (deploy/helm/infergate), in a module of its own so
// that the Helm SDK does not weigh on the gateway's.
package helm
