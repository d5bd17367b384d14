import './base.css';
import './context.css';
import './evals.css';
