package hub

import "context"

// AuthorizerFunc adapts a function to SecretAuthorizer.
type AuthorizerFunc func(ctx context.Context, cluster, saNamespace, saName, namespace string) (bool, error)

// CanListSecrets implements SecretAuthorizer.
func (f AuthorizerFunc) CanListSecrets(ctx context.Context, cluster, saNamespace, saName, namespace string) (bool, error) {
	return f(ctx, cluster, saNamespace, saName, namespace)
}

// TokenReviewerFunc adapts a function to authn.TokenReviewer.
type TokenReviewerFunc func(ctx context.Context, cluster, token string) (string, string, error)

// ReviewToken implements authn.TokenReviewer.
func (f TokenReviewerFunc) ReviewToken(ctx context.Context, cluster, token string) (string, string, error) {
	return f(ctx, cluster, token)
}
